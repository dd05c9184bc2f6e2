"""The predictor (numpy only, never torch): compute, comm, memory, schedule, power, predict."""

from scalelab.perf.predict import Prediction, predict, predict_layout

__all__ = ["Prediction", "predict", "predict_layout"]
