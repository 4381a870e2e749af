"""Tools beside the jobs: the sample corpus, tokenizer training, dataset inspection."""
