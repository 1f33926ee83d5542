"""What a reconstruction is worth and what it looks like: metrics against a ground truth
(:mod:`.metrics`), the verdict from the physics and the data (:mod:`.verdict`), and the
previews (:mod:`.previews`, :mod:`.opr_previews`)."""
