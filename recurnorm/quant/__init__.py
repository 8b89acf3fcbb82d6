"""recurnorm.quant"""
