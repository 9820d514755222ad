"""Membership inference attacks (image and language model); importing registers them."""
from attacks.mia import image, text  # noqa: F401
