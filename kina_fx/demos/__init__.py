"""The demos ``kina-fx demo`` runs: effects (:mod:`.effects`), the autograd MLP
(:mod:`.mlp`) and the same MLP with its forward compiled from MLIR (:mod:`.compiled`)."""
