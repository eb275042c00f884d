//! Prompts in, tokens out: generation over a loaded model.
