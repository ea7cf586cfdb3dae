"""Weight-only quantization: int8 and int4 schemes, RTN/AWQ/GPTQ, quantized checkpoints and the
decode kernels that read integer bytes, plus GGUF export.

Sits between infer/ (which loads and serves quantized checkpoints) and train/ (whose checkpoint
reader it uses).
"""
