"""edgevit.profile"""
