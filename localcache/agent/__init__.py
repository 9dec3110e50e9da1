"""The node agent: reconciles its own LocalModelNode, runs download Jobs, owns model folders."""
