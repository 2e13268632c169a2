"""Pictures: PNG figures drawn with pillow alone, one file per kind of figure (``charts.py``
line charts, ``matrices.py`` heatmaps, ``images.py`` image tiles and overlays, ``diagram.py``
the ViT's block diagram), on what ``canvas.py`` draws with; and the ViT paper's inspection
pictures of a model (``inspection.py``)."""
