//! Synthetic random-weight checkpoints in exactly the released layout (spec §9.1).
