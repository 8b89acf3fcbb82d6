"""recurnorm.model"""
