"""h5stream's benchmarks: one module per stage, run from the repository root.

    python -m benchmarks.stream     # h5stream bench on a 1 GB and a 4 GB class-sorted file, cold and warm
    python -m benchmarks.cold       # a store larger than RAM: the stream vs. the disk's O_DIRECT limit and h5py
    python -m benchmarks.pipeline   # augmenting stream vs. ImageDataGenerator and tf.data
    python -m benchmarks.augment    # one core: Augment vs. OpenCV, scipy, Pillow, numpy, ImageDataGenerator
    python -m benchmarks.ingest     # h5stream ingest vs. its decode floor and Keras' directory loader
    python -m benchmarks.quality    # test accuracy: in-memory shuffle vs. h5stream vs. a single-chunk shuffle
    python -m benchmarks.data       # a large class-sorted benchmark store
    python -m benchmarks.figures    # the README's preview and bench figures

Each prints a table, or one JSON object with ``--json``, and keeps its generated
data in ``bench-data/`` (git-ignored).  :mod:`benchmarks.harness` holds what the
suites share: interleaved rounds, medians and same-round ratios, CPU accounting,
page-cache warming and eviction, the data cache, and output.  Importing this
package imports nothing else.
"""
