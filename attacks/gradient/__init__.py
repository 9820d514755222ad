"""Gradient inversion of images: DLG, iDLG and Inverting Gradients on the shared machinery of inversion.py
(gradient matching over the entries the server sees), and SPEAR (spear.py), which solves a ReLU linear layer's
batch gradient for its inputs exactly instead of matching it."""
