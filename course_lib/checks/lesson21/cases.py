"""Lesson 21's models: the 8.36 B-parameter transformer the lesson plans, and one drawn at grading time."""
import random

from ...topics.planning import TransformerShape

BIG = TransformerShape(layers=40, hidden=4096, heads=32, vocab=65536, positions=8192, seq_len=8192)


def drawn_shape(draw: random.Random) -> TransformerShape:
    heads = draw.choice((8, 12, 16, 24))
    return TransformerShape(layers=draw.choice((12, 24, 32, 48)), hidden=heads * draw.choice((64, 128)),
                            heads=heads, vocab=draw.choice((32000, 50304, 128256)),
                            positions=draw.choice((0, 2048)), seq_len=draw.choice((1024, 2048, 4096)))
