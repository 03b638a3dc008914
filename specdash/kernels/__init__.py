"""The floor beneath the engine: the GEMM backends by name (`gemm_backends`), the CPU's exact C
kernels (`cpu_gemm`) and the Triton kernels (`triton/`). Nothing here imports the engine, a
session or SGLang; the engine and the SGLang patches pick what they need from here.
"""
