"""ddnb: distributed deep-learning training, built step by step in notebooks."""
__version__ = "0.1.0"
