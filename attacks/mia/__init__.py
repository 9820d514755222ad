"""Membership inference attacks (image and language model); each module registers its attacks."""
