"""What a host is: its facts read once (gather), parsed by pure parsers into frozen, typed `HostFacts`."""
