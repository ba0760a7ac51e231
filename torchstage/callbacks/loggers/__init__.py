"""Loggers: CSV, TensorBoard, MLflow, the console line and the progress bar, all through one protocol."""
