"""edgevit.export"""
