"""recurnorm.evaluate"""
