"""Fine-tuning and quantization-aware training on image folders."""
