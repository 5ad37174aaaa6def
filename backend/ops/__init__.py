"""The op contract (contract.py: the Backend base class), the argument rules and shape plans of
every op family (plans/, one module a family), the layer, movement, window and attention ops shared by every device,
value kinds (kinds.py), and the dispatch of big convolutions (bigconv.py) and conv gradients
(convgrad.py)."""
