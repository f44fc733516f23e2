"""Keras integration, public names: ``from h5stream.keras import ResumeCallback, StallMonitor``.

This module imports keras; ``import h5stream`` never imports it.
"""

from h5stream.adapters.keras import (
    ResumeCallback,
    StallMonitor,
    StreamBatches,
    as_keras,
    balanced_class_weight,
    load_resume_state,
)

__all__ = ["ResumeCallback", "StallMonitor", "StreamBatches", "as_keras", "balanced_class_weight",
           "load_resume_state"]
