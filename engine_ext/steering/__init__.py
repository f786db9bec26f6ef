"""Control-vector steering: llama.cpp's control-vector files, making vectors from prompt sets, mixing them."""
