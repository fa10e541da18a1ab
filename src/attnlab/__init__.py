"""attnlab: experiments on how attention scales its dot products."""

__version__ = "0.1.0"
