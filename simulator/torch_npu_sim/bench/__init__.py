"""Host-overhead benchmark of the overlay's update (``ascend-graph-patch bench``)."""
