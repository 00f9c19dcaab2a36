"""Evaluation: the harness (methods x questions -> tidy records), the paper's tables built from those
records, the benchmark families, the paper's reported numbers, and the retriever's recall analysis.
"""
