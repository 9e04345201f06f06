"""labkit: the measured, tested core of the Vertex AI training-optimization course.

The top level is framework-free and cheap to import. PyTorch lives in `labkit.torch`, TensorFlow
in `labkit.tf`; both are imported only when used, so a torch-only or TF-only image works.
"""

__version__ = "0.1.0"
