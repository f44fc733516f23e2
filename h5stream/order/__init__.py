"""Epoch order: pure functions from (rows, blocks, shard, seed, epoch, buffer) to row order and batches."""

from h5stream.order.epoch import (
    EpochLayout,
    batch_sizes,
    check_shard,
    epoch_layout,
    fill_schedule,
    shard_layout,
    shard_segments,
)

__all__ = ["EpochLayout", "batch_sizes", "check_shard", "epoch_layout", "fill_schedule", "shard_layout",
           "shard_segments"]
