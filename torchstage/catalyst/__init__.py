"""Catalyst 20.12 spellings, each mapped to torchstage's with a one-time note: kept here so that core classes meet
them through one hook each."""
