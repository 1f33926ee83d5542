"""The reconstruction job: scan file in -> engine with checkpoints -> product + previews out."""
