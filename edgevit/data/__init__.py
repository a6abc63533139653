"""edgevit.data"""
