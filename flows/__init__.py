"""Prefect flows: composition only. The stages are in tasks/, the domain in enginefoundry/."""
