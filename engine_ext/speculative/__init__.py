"""Speculative decoding: drafters (n-gram, draft model, MTP, DFlash/DSpark), lossless verification, statistics."""
