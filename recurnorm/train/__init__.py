"""recurnorm.train"""
