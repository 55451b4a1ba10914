"""Download of a model's files from the Hugging Face Hub into a folder (``vllm-operator download``).

The command a ModelCache's download Job runs, in the operator image, with the cache's
volume mounted: it fills one folder with a repo's files at one commit, exactly as ``vllm
serve DIR`` reads them, and leaves a marker once every file is there and verified. It is
written to be killed: a file being fetched lives under a name of its own until its bytes
are checked, a killed pod's partial file is resumed by the next pod with a Range request,
and a finished folder is recognised without fetching anything.

``hub`` resolves the revision and fetches one file (``huggingface_hub`` for the HTTP, its
typed errors mapped to our reasons), ``folder`` is the layout on disk (the files, the
partial files, the marker) and what is already there, ``report`` is the result and the
progress document, ``progress`` serves that document over HTTP while the download runs,
``run`` orders the steps, ``cli`` is the command. The package imports no Kopf and no
Kubernetes client: it runs in a plain Job and sends no weight through the operator.
"""
