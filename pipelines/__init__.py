"""Ray Data jobs: read the corpus, split, admit through the Gate, summarize, write."""
