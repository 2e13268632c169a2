"""Pictures: PNG figures drawn with pillow alone (``plot.py``) and the ViT paper's
inspection pictures of a model (``inspection.py``)."""
