"""measure/vllm"""
