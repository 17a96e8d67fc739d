"""From a model to a score: beam search, translating files, valid loss + BLEU, test BLEU, averaging, fairseq export."""
