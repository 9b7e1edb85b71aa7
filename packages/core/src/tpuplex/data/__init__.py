"""Data every task reads through: tables and their tokenization cache (`tables`, `tokens`), your own labelled table
(`custom`), prepared shards (`shards`, `token_shards`) and prepared images (`images`)."""
