"""Model stage of the data flow: norm-alignment layer, projector, the LLaVA model, builders."""
