"""blockscaled/weight_only"""
