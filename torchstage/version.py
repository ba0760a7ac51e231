"""The version of torchstage, in a leaf module that anything may import (the package root imports everything)."""
__version__ = "0.1.0"
