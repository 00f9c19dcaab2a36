"""Data: the QA formats (Search-R1 parquet, CoSearch parquet, FlashRAG jsonl), the passage record and
its ``contents`` convention, streaming of wiki-18-format corpora, and downloads of the real artefacts.
"""
