"""The models a measurement runs, by name, whoever's they are: :mod:`.catalog` turns ``model``
(with ``model_size``, ``seed``, ``seq_len``) into a checked spec and a built :class:`.workload.Workload`
— perfkit's synthetic ``mlp``, ``transformer`` and ``convnet`` (:mod:`.configs`, :mod:`.models`,
:mod:`.synthetic`: seeded tasks, analytic FLOP), a user's entry point ``package.module:function``
(:mod:`.user`, the workload contract), Hugging Face models ``hf:<model_type>`` (:mod:`.hf`) and
``torchvision:<name>`` (:mod:`.vision_tv`). A new model family goes here. May import ``core``
only: a workload knows nothing of how it is measured."""
