"""edgevit.quantize"""
