"""placeholder to be replaced by the tokenizer commands"""
def register(app):
    pass
