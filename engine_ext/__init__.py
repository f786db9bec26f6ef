"""llmtui's inference engine: llama.cpp bindings, generation, speculative decoding, steering, worker process."""
