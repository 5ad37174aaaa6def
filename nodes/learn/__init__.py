"""The learning nodes: the network builder's layer nodes (layers), Train/Apply/Save/Load Network (train),
the labelled image folder (dataset), gathered in network.NETWORK_NODES and dataset.DATASET_NODES."""
