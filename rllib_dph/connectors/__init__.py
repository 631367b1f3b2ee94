"""Connector pieces of rllib_dph."""

from rllib_dph.connectors.pef import AddPefRows, PefRowSampler

__all__ = ["AddPefRows", "PefRowSampler"]
