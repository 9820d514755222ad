"""Gradient inversion of images: DLG, iDLG and Inverting Gradients on the shared machinery of inversion.py
(gradient matching over the entries the server sees)."""
