"""What a run is built from, read from its config: the model (fresh, or fitted
from ``--init`` weights) and the training and test batches."""

from pathlib import Path

from ..data import Batches, augment, dataset_info, load_dataset
from ..models import ViT
from ..weights import PretrainedError, read_pretrained


def build_model(config):
    """A new run's ViT and the notes on how it was made: the preset with fresh
    weights, or with ``config.init`` the weights of that file (a checkpoint, a run
    folder's best.npz, or pre-trained weights ``tinyvit.weights`` reads) fitted
    to the run as the ViT paper fine-tunes: the position embeddings resized to the
    run's image size, and a zero head when the file's class count differs from
    the dataset's, or the file has no head, or ``reset_head`` asks for one."""
    if config.init is None:
        return ViT(config.model_config(), seed=config.seed), []
    pretrained = read_pretrained(init_path(config.init))
    fields = config.model_fields()
    channels = pretrained.fields.get("in_channels")
    given = "in_channels" in config.model_overrides  # else the dataset's
    if channels not in (None, fields["in_channels"]) and not given:
        raise PretrainedError(f"{pretrained.path}: the weights take images of {channels} "
                              f"channel(s), but {config.dataset}'s have {fields['in_channels']}: "
                              f"fine-tune them on a dataset of {channels}-channel images")
    head = pretrained.state.get("head.weight")
    keep_head = head is not None and head.shape[0] == fields["num_classes"]
    notes = []
    model = pretrained.build(head="load" if keep_head and not config.reset_head else "zero",
                             seed=config.seed, log=notes.append, **fields)
    return model, notes


def init_path(path):
    """What ``--init`` names: a run folder means its best.npz; any other path as it is."""
    path = Path(path)
    return path / "best.npz" if (path / "best.npz").is_file() else path


def make_batches(config, split):
    """The train or test ``Batches`` of a run."""
    info = dataset_info(config.dataset)
    images, labels = load_dataset(config.dataset, split, data_dir=config.data_dir)
    subset = config.train_subset if split == "train" else config.test_subset
    if subset:
        images, labels = images[:subset], labels[:subset]
    if split == "test":
        return Batches(images, labels, config.eval_batch_size, mean=info.mean, std=info.std,
                       image_size=config.image_size(), num_classes=len(info.classes))
    return training_batches(config, images, labels)


def training_batches(config, images, labels):
    """The run's training ``Batches`` over these images: shuffled, full batches only,
    with the config's augmentation."""
    info = dataset_info(config.dataset)
    pipeline = augment.pipeline(config.max_shift, config.flip, config.erasing)
    return Batches(images, labels, config.batch_size, mean=info.mean, std=info.std,
                   shuffle=True, drop_last=True, seed=config.seed, augment=pipeline,
                   image_size=config.image_size(), num_classes=len(info.classes))
