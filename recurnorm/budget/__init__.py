"""recurnorm.budget"""
