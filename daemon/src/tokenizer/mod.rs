//! The K3 tokenizer (spec §7) and chat template (spec §8).
