"""Model formats: GGUF files and HF safetensors directories -> ModelConfig + TensorSource.

`open_model(path)` is the one entry point; it dispatches on whether `path` is a GGUF file
or a directory holding config.json + *.safetensors.
"""
