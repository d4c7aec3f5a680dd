"""sanitize"""
