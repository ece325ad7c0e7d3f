"""emoreward: reward models, zero-shot judges and rankings for emotion-preference evaluation."""

__version__ = "0.1.0"
